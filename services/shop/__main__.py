from services.shop.app import main

main()
